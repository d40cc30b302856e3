"""ASR throughput and latency benchmark (not a test): one run over the same segments.

Segments: the 20 real evaluation utterances (1.1-7.1 s) in the 8 kHz mu-law condition, twice (40
segments). Measured, one after the other on this machine:
- ours (ONNX Runtime, default window policy) at batch 1, 4, 8, 16, for int8 and fp32;
- the SegmentBatcher with every segment submitted at once (per-segment latency percentiles);
- faster-whisper int8 (same weights, greedy): sequential, and its BatchedInferencePipeline (batch 16)
  on the same segments given as clip_timestamps.
Throughput is audio seconds per wall second, and per CPU second of this process (less sensitive to
other work on a shared machine). Writes bench/results/asr.json.

`--windows` instead measures the encoder window policy: WER in the three telephony conditions and
throughput (batch 16) per window bucket, for int8 and fp32; writes bench/results/asr_windows.json.
`--options` instead measures the decoding options (previous-text context, beam 5, the base tier, base
with beam 5) at batch 16 on the same segments, each as a speed ratio to the default; writes
bench/results/asr_options.json.

    .venv/bin/python bench/asr.py [--repeat 2] [--threads 2] [--windows | --options]
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
from pipeline.asr.ct2 import find_source
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


def run_ours(
    recognizer: Recognizer, segments: list[AudioSegment], batch: int,
    contexts: list[tuple[int, ...]] | None = None,
) -> tuple[float, float, list[str]]:
    """(wall s, CPU s, texts) for decoding all segments in batches of `batch` (each after its context)."""
    def prompts(i: int) -> list[tuple[int, ...]] | None:
        return contexts[i : i + batch] if contexts is not None else None

    recognizer.recognize(segments[:batch], contexts=prompts(0))  # warm-up: first-run allocations
    started, cpu = time.perf_counter(), time.process_time()
    texts = []
    for i in range(0, len(segments), batch):
        for slot in recognizer.recognize(segments[i : i + batch], contexts=prompts(i)):
            assert isinstance(slot, TranscriptResult), slot
            texts.append(slot.text)
    return time.perf_counter() - started, time.process_time() - cpu, texts


# The decoding options the accuracy table compares, each against the default on the same segments.
OPTIONS: dict[str, dict[str, object]] = {
    "default": {},
    "context 64": {"context_tokens": 64},
    "beam 5": {"beam_size": 5},
    "base": {"model": "base"},
    "base, beam 5": {"model": "base", "beam_size": 5},
}


def options_sweep(settings: Settings, segments: list[AudioSegment], references: list[str]) -> None:
    """Batch-16 throughput and WER of each decoding option, and its speed as a ratio to the default.
    With context, segment i is decoded after segment i-1's default text, as one leg's turns would be
    (the prompt's cost: up to 64 more tokens in the first decoder step)."""
    audio_s = sum(s.audio.size for s in segments) / 16000
    table = Table("option", "audio s / wall s", "audio s / CPU s", "WER %", "speed vs default",
                  title=f"decoding options, batch 16, {len(segments)} segments")
    rows: list[dict[str, object]] = []
    previous: list[tuple[int, ...]] = []
    for name, update in OPTIONS.items():
        variant = settings.model_copy(update=update)
        recognizer = Recognizer.load(model_folder(variant), variant)
        contexts = None
        if variant.context_tokens > 0:
            contexts = [(), *previous[:-1]]
        wall, cpu, texts = run_ours(recognizer, segments, 16, contexts)
        if name == "default":
            previous = [r.tokens for r in recognizer.recognize(segments) if isinstance(r, TranscriptResult)]
        rows.append({"option": name, "settings": update, "wall_s": wall, "cpu_s": cpu, "audio_s": audio_s,
                     "audio_s_per_s": audio_s / wall, "audio_s_per_cpu_s": audio_s / cpu,
                     "wer": word_error_rate(references, texts)})
        rows[-1]["speed_vs_default"] = float(rows[-1]["audio_s_per_s"]) / float(rows[0]["audio_s_per_s"])  # type: ignore[arg-type]
        table.add_row(name, f"{audio_s / wall:.1f}", f"{audio_s / cpu:.1f}", f"{100 * float(rows[-1]['wer']):.1f}",  # type: ignore[arg-type]
                      f"{rows[-1]['speed_vs_default']:.2f}x")
        console.print(f"{name}: {audio_s / wall:.1f} audio s / s")
        del recognizer
    console.print(table)
    out = RESULTS.with_name("asr_options.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
                               "threads": settings.intra_op_threads, "quantization": settings.quantization,
                               "segments": len(segments), "rows": rows}, indent=2) + "\n")
    console.print(f"wrote {out}")


def window_sweep(folder: Path, settings: Settings) -> None:
    """WER per condition and batch-16 throughput for each encoder window bucket."""
    base = load_eval_set()
    sets = {c: conditioned(base, c) for c in ("16k", "8k", "8k-mulaw")}
    table = Table(
        "quant", "window bucket s", "WER 16k", "WER 8k", "WER 8k μ-law", "audio s / wall s", "audio s / CPU s"
    )
    rows = []
    for quantization in ("int8", "fp32"):
        for bucket in (0.0, 2.0, 5.0, 10.0):
            recognizer = Recognizer.load(
                folder, settings.model_copy(update={"quantization": quantization, "window_bucket_s": bucket})
            )
            row: dict[str, object] = {"quantization": quantization, "bucket_s": bucket}
            wall = cpu = audio = 0.0
            for condition, utterances in sets.items():
                segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]
                w, c, texts = run_ours(recognizer, segments, 16)
                wall, cpu, audio = wall + w, cpu + c, audio + sum(u.duration_s for u in utterances)
                row[f"wer_{condition}"] = word_error_rate([u.reference for u in utterances], texts)
            row |= {"audio_s_per_s": audio / wall, "audio_s_per_cpu_s": audio / cpu}
            rows.append(row)
            table.add_row(
                quantization,
                "30 (full)" if bucket == 0 else f"{bucket:g}",
                *(f"{100 * float(row[f'wer_{c}']):.1f}" for c in sets),  # type: ignore[arg-type]
                f"{audio / wall:.1f}",
                f"{audio / cpu:.1f}",
            )
            console.print(row)
    console.print(table)
    out = RESULTS.with_name("asr_windows.json")
    out.write_text(json.dumps({"threads": settings.intra_op_threads, "rows": rows}, indent=2) + "\n")


async def run_batcher(
    recognizer: Recognizer, segments: list[AudioSegment], settings: Settings, load: float
) -> dict[str, float]:
    """Segments arrive as a Poisson process carrying `load` audio seconds per second (as from many
    concurrent legs); latency is submit -> transcript, queueing included."""
    batcher = SegmentBatcher.from_settings(recognizer, settings)
    await batcher.start()
    rng = np.random.default_rng(0)
    mean_gap = float(np.mean([s.audio.size / 16000 for s in segments])) / load

    async def one(segment: AudioSegment, delay: float) -> tuple[float, int]:
        await asyncio.sleep(delay)
        started = time.perf_counter()
        result = await batcher.submit(segment)
        return (time.perf_counter() - started) * 1000, result.timings.batch_size

    delays = np.cumsum(rng.exponential(mean_gap, len(segments)))
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(one(s, float(d)) for s, d in zip(segments, delays, strict=True)))
    wall = time.perf_counter() - started
    await batcher.close()
    latencies = [o[0] for o in outcomes]
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
    return {
        "offered_audio_s_per_s": load,
        "wall_s": wall,
        "latency_p50_ms": p50,
        "latency_p90_ms": p90,
        "latency_p99_ms": p99,
        "mean_batch_size": float(np.mean([o[1] for o in outcomes])),
    }


def run_faster_whisper(
    segments: list[AudioSegment], threads: int, settings: Settings
) -> dict[str, tuple[float, float, list[str]]]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    folder = find_source(settings.model).ctranslate2_folder(Path(settings.models_dir) / ".ct2")
    model = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=threads)
    options = {"beam_size": 1, "without_timestamps": True, "condition_on_previous_text": False}
    model.transcribe(segments[0].audio, **options)  # warm-up
    started, cpu = time.perf_counter(), time.process_time()
    sequential = [" ".join(s.text for s in model.transcribe(seg.audio, **options)[0]) for seg in segments]
    out = {
        "faster-whisper int8, one by one": (
            time.perf_counter() - started,
            time.process_time() - cpu,
            sequential,
        )
    }
    # The batched pipeline takes one audio and clip boundaries: lay the segments end to end.
    audio = np.concatenate([s.audio for s in segments])
    bounds = np.cumsum([0] + [s.audio.size for s in segments]) / 16000
    clips = [{"start": float(a), "end": float(b)} for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    pipeline = BatchedInferencePipeline(model)
    started, cpu = time.perf_counter(), time.process_time()
    batched = [s.text for s in pipeline.transcribe(audio, clip_timestamps=clips, batch_size=16, **options)[0]]
    out["faster-whisper int8, batched x16"] = (
        time.perf_counter() - started,
        time.process_time() - cpu,
        batched,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=2, help="times the 20 utterances are repeated")
    parser.add_argument(
        "--threads", type=int, default=2, help="intra-op threads (ours) / cpu_threads (theirs)"
    )
    parser.add_argument(
        "--load", type=float, default=8.0, help="batcher run: offered audio seconds per second"
    )
    parser.add_argument("--windows", action="store_true", help="measure the window policy instead")
    parser.add_argument("--options", action="store_true",
                        help="measure the decoding options (context, beam 5, base) against the default instead")
    args = parser.parse_args()
    if args.windows:
        settings = Settings(intra_op_threads=args.threads)
        window_sweep(model_folder(settings), settings)
        return
    utterances = conditioned(load_eval_set(), "8k-mulaw") * args.repeat
    segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]
    references = [u.reference for u in utterances]
    if args.options:
        options_sweep(Settings(intra_op_threads=args.threads), segments, references)
        return
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
                wall, cpu, texts = run_ours(recognizer, segments, batch)
                rows.append(
                    {
                        "system": f"ours {quantization}",
                        "batch": batch,
                        "wall_s": wall,
                        "cpu_s": cpu,
                        "audio_s": audio_s,
                        "wer": word_error_rate(references, texts),
                    }
                )
                console.print(f"ours {quantization} batch {batch}: {audio_s / wall:.1f} audio s / s")
            if quantization == settings.quantization:
                batcher_stats = asyncio.run(run_batcher(recognizer, segments, settings, args.load))
                ours_rss = peak_rss_mb()  # the default variant alone (the other one loads next)
            del recognizer
        for name, (wall, cpu, texts) in run_faster_whisper(segments, args.threads, settings).items():
            rows.append(
                {
                    "system": name,
                    "batch": 16 if "batched" in name else 1,
                    "wall_s": wall,
                    "cpu_s": cpu,
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
        row["audio_s_per_cpu_s"] = float(row["audio_s"]) / float(row["cpu_s"])  # type: ignore[arg-type]
    speed = {(r["system"], r["batch"]): r["audio_s_per_s"] for r in rows}
    ours16 = speed[(f"ours {settings.quantization}", 16)]
    cpu_speed = {(r["system"], r["batch"]): r["audio_s_per_cpu_s"] for r in rows}
    ours_key, theirs_key = (f"ours {settings.quantization}", 16), ("faster-whisper int8, batched x16", 16)
    ratios = {
        "ours_b16_vs_faster_whisper_batched": ours16 / speed[theirs_key],  # type: ignore[operator]
        "ours_b16_vs_ours_b1": ours16 / speed[(f"ours {settings.quantization}", 1)],  # type: ignore[operator]
        "cpu_time_ours_b16_vs_faster_whisper_batched": cpu_speed[ours_key] / cpu_speed[theirs_key],  # type: ignore[operator]
        "cpu_time_ours_b16_vs_ours_b1": cpu_speed[ours_key] / cpu_speed[(f"ours {settings.quantization}", 1)],  # type: ignore[operator]
    }
    table = Table(
        "system",
        "batch",
        "audio s / wall s",
        "audio s / CPU s",
        "WER %",
        title=f"ASR throughput, {n} segments",
    )
    for r in rows:
        table.add_row(
            str(r["system"]),
            str(r["batch"]),
            f"{r['audio_s_per_s']:.1f}",
            f"{r['audio_s_per_cpu_s']:.1f}",
            f"{100 * float(r['wer']):.1f}",  # type: ignore[arg-type]
        )
    console.print(table)
    console.print(
        f"batcher at {batcher['offered_audio_s_per_s']:g} audio s/s offered (mean batch "
        f"{batcher['mean_batch_size']:.1f}; max_batch {settings.max_batch}, max_wait {settings.max_wait_ms} ms): latency p50 "
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
