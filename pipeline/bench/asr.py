"""`callqa bench asr`: the engine's speed and WER on the same segments, ours beside faster-whisper.

Segments: the 20 real evaluation utterances (1.1-7.1 s) in the 8 kHz μ-law condition, ``repeat`` times
(40 segments by default). Measured one after the other on this machine:
- ours (ONNX Runtime, default window policy) at batch 1, 4, 8, 16, for int8 and fp32;
- the SegmentBatcher with the segments arriving as a Poisson process (per-segment latency percentiles);
- faster-whisper int8 (same weights, greedy): sequential, and its BatchedInferencePipeline (batch 16)
  on the same segments given as clip_timestamps.
Throughput is audio seconds per wall second, and per CPU second of this process (less sensitive to
other work on a shared machine). Result: ``asr``.

``--windows`` measures the encoder window policy instead: WER in three telephony conditions and
throughput (batch 16) per window bucket, for int8 and fp32. Result: ``asr-windows``.
``--options`` measures the decoding options instead (previous-text context, beam 5, the base tier, base
with beam 5) at batch 16 on the same segments, each as a speed ratio to the default. Result: ``asr-options``.
"""

from __future__ import annotations

import asyncio
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from pipeline.asr.batcher import SegmentBatcher
from pipeline.asr.build import build_model
from pipeline.asr.ct2 import find_source
from pipeline.asr.manifest import ModelNotBuiltError, latest_model_folder
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.bench.offered import arrivals, offer
from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.config import Settings
from pipeline.eval.conditions import conditioned
from pipeline.eval.dataset import EvalUtterance, load_eval_set
from pipeline.eval.wer import word_error_rate

# The decoding options the accuracy table compares, each against the default on the same segments.
OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "context 64": {"context_tokens": 64},
    "beam 5": {"beam_size": 5},
    "base": {"model": "base"},
    "base, beam 5": {"model": "base", "beam_size": 5},
}
WINDOW_BUCKETS_S = (0.0, 2.0, 5.0, 10.0)  # 0: the full 30 s window
BATCHES = (1, 4, 8, 16)


@dataclass(frozen=True)
class AsrOptions:
    repeat: int = 2  # times the 20 utterances are repeated
    threads: int = 2  # intra-op threads (ours), cpu_threads (faster-whisper)
    load: float = 8.0  # the batcher run's offered audio seconds per second
    out: Path = RESULTS


@dataclass(frozen=True)
class Timed:
    """One system's pass over the segments: wall and CPU seconds, and its texts in order."""

    wall_s: float
    cpu_s: float
    texts: list[str] = field(repr=False)


@dataclass(frozen=True)
class SpeedRow:
    """One system at one batch size over the same segments."""

    system: str
    batch: int
    wall_s: float
    cpu_s: float
    audio_s: float
    wer: float

    @property
    def audio_s_per_s(self) -> float:
        return self.audio_s / self.wall_s

    @property
    def audio_s_per_cpu_s(self) -> float:
        return self.audio_s / self.cpu_s

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "audio_s_per_s": self.audio_s_per_s, "audio_s_per_cpu_s": self.audio_s_per_cpu_s}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def model_folder(settings: Settings) -> Path:
    try:
        return latest_model_folder(Path(settings.models_dir), settings.model)
    except ModelNotBuiltError:
        return build_model(settings.model, Path(settings.models_dir)).folder


def segments_of(utterances: list[EvalUtterance]) -> list[AudioSegment]:
    return [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]


def run_ours(recognizer: Recognizer, segments: list[AudioSegment], batch: int,
             contexts: list[tuple[int, ...]] | None = None) -> Timed:
    """All segments decoded in batches of ``batch`` (each after its context), after one warm-up batch."""
    def prompts(i: int) -> list[tuple[int, ...]] | None:
        return contexts[i : i + batch] if contexts is not None else None

    recognizer.recognize(segments[:batch], contexts=prompts(0))  # warm-up: first-run allocations
    started, cpu = time.perf_counter(), time.process_time()
    texts: list[str] = []
    for i in range(0, len(segments), batch):
        for slot in recognizer.recognize(segments[i : i + batch], contexts=prompts(i)):
            if not isinstance(slot, TranscriptResult):
                raise RuntimeError(f"segment {len(texts)} was not transcribed: {slot}")
            texts.append(slot.text)
    return Timed(time.perf_counter() - started, time.process_time() - cpu, texts)


# ---- speed: ours at each batch size, the batcher, faster-whisper -----------------------------------------
def run_speed(options: AsrOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    utterances = conditioned(load_eval_set(), "8k-mulaw") * options.repeat
    segments = segments_of(utterances)
    references = [u.reference for u in utterances]
    audio_s = sum(u.duration_s for u in utterances)
    settings = Settings(intra_op_threads=options.threads)  # type: ignore[call-arg]
    rows: list[SpeedRow] = []
    batcher: dict[str, float] | None = None
    ours_rss = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = model_folder(settings)
        except OSError:  # models/ not writable: build where we can
            folder = build_model(settings.model, Path(tmp)).folder
        for quantization in ("int8", "fp32"):
            recognizer = Recognizer.load(folder, settings.model_copy(update={"quantization": quantization}))
            for batch in BATCHES:
                timed = run_ours(recognizer, segments, batch)
                rows.append(SpeedRow(f"ours {quantization}", batch, timed.wall_s, timed.cpu_s, audio_s,
                                     word_error_rate(references, timed.texts)))
                console.print(f"ours {quantization} batch {batch}: {audio_s / timed.wall_s:.1f} audio s / s")
            if quantization == settings.graphs_for("whisper"):
                with console.status(f"the batcher at {options.load:g} audio s/s offered..."):
                    batcher = asyncio.run(run_batcher(recognizer, segments, settings, options.load))
                ours_rss = peak_rss_mb()  # the default variant alone (the other one loads next)
            del recognizer
        with console.status("faster-whisper, one by one and batched..."):
            for name, timed in run_faster_whisper(segments, options.threads, settings).items():
                rows.append(SpeedRow(name, 16 if "batched" in name else 1, timed.wall_s, timed.cpu_s, audio_s,
                                     word_error_rate(references, timed.texts)))
    if batcher is None:
        raise RuntimeError(f"quantization {settings.quantization!r} is neither int8 nor fp32 for Whisper")
    ratios = speed_ratios(rows, settings.graphs_for("whisper"))
    rss = {"ours": ours_rss, "with_faster_whisper": peak_rss_mb()}
    doc = record("asr", settings_that_matter(settings), {
        "segments": len(segments), "repeat": options.repeat, "rows": [r.as_json() for r in rows],
        "batcher": batcher, "ratios": ratios, "peak_rss_mb": rss,
    })
    return doc, write_result("asr", doc, options.out)


async def run_batcher(recognizer: Recognizer, segments: list[AudioSegment], settings: Settings,
                      load: float) -> dict[str, float]:
    """Segments arriving as a Poisson process carrying ``load`` audio seconds per second (as from many
    concurrent legs); latency is submit -> transcript, queueing included."""
    batcher = SegmentBatcher.from_settings(recognizer, settings)
    await batcher.start()
    done, wall = await offer(batcher, segments, arrivals(segments, load))
    await batcher.close()
    p50, p90, p99 = np.percentile([d.latency_s * 1000 for d in done], [50, 90, 99])
    return {"offered_audio_s_per_s": load, "wall_s": wall, "latency_p50_ms": float(p50),
            "latency_p90_ms": float(p90), "latency_p99_ms": float(p99),
            "mean_batch_size": float(np.mean([d.batch_size for d in done]))}


def run_faster_whisper(segments: list[AudioSegment], threads: int, settings: Settings) -> dict[str, Timed]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    folder = find_source(settings.model).ctranslate2_folder(Path(settings.models_dir) / ".ct2")
    model = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=threads)
    options: dict[str, Any] = {"beam_size": 1, "without_timestamps": True, "condition_on_previous_text": False}
    model.transcribe(segments[0].audio, **options)  # warm-up
    started, cpu = time.perf_counter(), time.process_time()
    sequential = [" ".join(s.text for s in model.transcribe(seg.audio, **options)[0]) for seg in segments]
    out = {"faster-whisper int8, one by one": Timed(time.perf_counter() - started, time.process_time() - cpu,
                                                    sequential)}
    # The batched pipeline takes one audio and clip boundaries: lay the segments end to end.
    audio = np.concatenate([s.audio for s in segments])
    bounds = np.cumsum([0] + [s.audio.size for s in segments]) / 16000
    clips = [{"start": float(a), "end": float(b)} for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    pipeline = BatchedInferencePipeline(model)
    started, cpu = time.perf_counter(), time.process_time()
    batched = [s.text for s in pipeline.transcribe(audio, clip_timestamps=clips, batch_size=16, **options)[0]]
    out["faster-whisper int8, batched x16"] = Timed(time.perf_counter() - started, time.process_time() - cpu,
                                                    batched)
    return out


def speed_ratios(rows: list[SpeedRow], quantization: str) -> dict[str, float]:
    """Ours at batch 16 against faster-whisper batched and against our batch 1, by wall and CPU time."""
    by = {(r.system, r.batch): r for r in rows}
    ours16, ours1 = by[(f"ours {quantization}", 16)], by[(f"ours {quantization}", 1)]
    theirs = by[("faster-whisper int8, batched x16", 16)]
    return {
        "ours_b16_vs_faster_whisper_batched": ours16.audio_s_per_s / theirs.audio_s_per_s,
        "ours_b16_vs_ours_b1": ours16.audio_s_per_s / ours1.audio_s_per_s,
        "cpu_time_ours_b16_vs_faster_whisper_batched": ours16.audio_s_per_cpu_s / theirs.audio_s_per_cpu_s,
        "cpu_time_ours_b16_vs_ours_b1": ours16.audio_s_per_cpu_s / ours1.audio_s_per_cpu_s,
    }


def run_options(options: AsrOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    """Batch-16 throughput and WER of each decoding option, and its speed as a ratio to the default.
    With context, segment i is decoded after segment i-1's default text, as one leg's turns would be
    (the prompt's cost: up to 64 more tokens in the first decoder step)."""
    utterances = conditioned(load_eval_set(), "8k-mulaw") * options.repeat
    segments, references = segments_of(utterances), [u.reference for u in utterances]
    settings = Settings(intra_op_threads=options.threads)  # type: ignore[call-arg]
    audio_s = sum(s.audio.size for s in segments) / 16000
    rows: list[dict[str, Any]] = []
    previous: list[tuple[int, ...]] = []
    default_speed = 0.0
    for name, update in OPTIONS.items():
        variant = settings.model_copy(update=update)
        recognizer = Recognizer.load(model_folder(variant), variant)
        contexts = [(), *previous[:-1]] if variant.context_tokens > 0 else None
        timed = run_ours(recognizer, segments, 16, contexts)
        if name == "default":
            previous = [r.tokens for r in recognizer.recognize(segments) if isinstance(r, TranscriptResult)]
            default_speed = audio_s / timed.wall_s
        speed = audio_s / timed.wall_s
        rows.append({"option": name, "settings": update, "wall_s": timed.wall_s, "cpu_s": timed.cpu_s,
                     "audio_s": audio_s, "audio_s_per_s": speed, "audio_s_per_cpu_s": audio_s / timed.cpu_s,
                     "wer": word_error_rate(references, timed.texts), "speed_vs_default": speed / default_speed})
        console.print(f"{name}: {speed:.1f} audio s / s")
        del recognizer
    doc = record("asr-options", settings_that_matter(settings), {"segments": len(segments), "rows": rows})
    return doc, write_result("asr-options", doc, options.out)


# ---- the window policy ----------------------------------------------------------------------------------
def run_windows(options: AsrOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    """WER per condition and batch-16 throughput for each encoder window bucket, int8 and fp32."""
    settings = Settings(intra_op_threads=options.threads)  # type: ignore[call-arg]
    folder = model_folder(settings)
    base = load_eval_set()
    sets = {c: conditioned(base, c) for c in ("16k", "8k", "8k-mulaw")}
    rows: list[dict[str, Any]] = []
    for quantization in ("int8", "fp32"):
        for bucket in WINDOW_BUCKETS_S:
            recognizer = Recognizer.load(
                folder, settings.model_copy(update={"quantization": quantization, "window_bucket_s": bucket}))
            row: dict[str, Any] = {"quantization": quantization, "bucket_s": bucket}
            wall = cpu = audio = 0.0
            for condition, utterances in sets.items():
                timed = run_ours(recognizer, segments_of(utterances), 16)
                wall, cpu, audio = wall + timed.wall_s, cpu + timed.cpu_s, audio + sum(u.duration_s for u in utterances)
                row[f"wer_{condition}"] = word_error_rate([u.reference for u in utterances], timed.texts)
            row |= {"audio_s_per_s": audio / wall, "audio_s_per_cpu_s": audio / cpu}
            rows.append(row)
            console.print(f"{quantization}, window bucket {bucket:g} s: {audio / wall:.1f} audio s / s")
    doc = record("asr-windows", settings_that_matter(settings), {"rows": rows})
    return doc, write_result("asr-windows", doc, options.out)
