"""`callqa bench moonshine`: what Moonshine costs per second of speech, batch 1 and batched, built graphs
beside the packages' own.

Segments: the 20 real evaluation utterances (1.1-7.1 s, 51 s of speech) in the 8 kHz μ-law condition,
decoded by each model variant one at a time (batch 1) and all together (batch 20: every decoder step of
the 20 segments in one run, padded and masked), on ``threads`` intra-op threads. Variants: moonshine-tiny
fp32 (the default) and int8 (the shipped dynamic-int8 kernels), moonshine-base fp32 (weight casts
folded at build), and each model's shipped ``.ort`` graphs as the package ships them (batch 1 only:
base-en's shipped decoder has no encoder mask, tiny-en's does not mask). Figures: wall and process-CPU milliseconds per speech-second, and
the WER of the texts (the same at both batch sizes for the built graphs). Result: ``moonshine``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.config import Settings, get_settings

MODELS = ("moonshine-tiny", "moonshine-base")


@dataclass(frozen=True)
class MoonshineBenchOptions:
    threads: int = 1
    repeat: int = 2  # timed passes over the 20 segments per row (the best is kept: least disturbed)
    out: Path = RESULTS
    settings: Settings = field(default_factory=get_settings)


def run_moonshine(options: MoonshineBenchOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    from pipeline.asr.engine import Engine
    from pipeline.asr.moonshine_graphs import DECODER_FILE, ENCODER_FILE, find_source
    from pipeline.asr.moonshine_model import MoonshineOnnx
    from pipeline.asr.moonshine_recognizer import MoonshineRecognizer
    from pipeline.asr.results import AudioSegment
    from pipeline.eval.conditions import conditioned
    from pipeline.eval.dataset import load_eval_set
    from pipeline.eval.wer import word_error_rate

    utterances = conditioned(load_eval_set(), "8k-mulaw")
    segments = [AudioSegment(0, u.audio.size // 16, u.audio) for u in utterances]
    speech_s = sum(u.duration_s for u in utterances)
    rows: list[dict[str, Any]] = []
    for name in MODELS:
        settings = options.settings.model_copy(update={"model": name, "intra_op_threads": options.threads,
                                                       "quantization": "fp32"})
        built = Engine.load(settings=settings).recognizer  # built on first use, canary checked
        assert isinstance(built, MoonshineRecognizer)
        for variant in ("fp32", "int8", "shipped"):
            if variant not in (*built.model.manifest.graphs, "shipped"):
                continue  # base-en has no int8 graphs
            recognizer = built if variant != "int8" else MoonshineRecognizer.load(
                built.model.folder, settings.model_copy(update={"quantization": "int8"}))
            if variant == "shipped":
                source = find_source(name)
                model = MoonshineOnnx.shipped(recognizer.model, source.file(ENCODER_FILE), source.file(DECODER_FILE),
                                              options.threads)
                recognizer = MoonshineRecognizer(model, recognizer.decoder.options)
                batches: tuple[int, ...] = (1,)  # base-en's shipped decoder has no mask, tiny-en's does not mask
            else:
                batches = (1, len(segments))
            recognizer.recognize(segments[:2])  # warm-up: first-run allocations
            for batch in batches:
                best: tuple[float, float, list[str]] | None = None
                for _ in range(options.repeat):
                    wall, cpu = time.perf_counter(), time.process_time()
                    texts: list[str] = []
                    for i in range(0, len(segments), batch):
                        texts += [r.text if not isinstance(r, Exception) else "" for r in
                                  recognizer.recognize(segments[i:i + batch])]
                    timed = (time.perf_counter() - wall, time.process_time() - cpu, texts)
                    best = timed if best is None or timed[0] < best[0] else best
                assert best is not None
                rows.append({"model": name, "graphs": variant, "batch": batch,
                             "wall_ms_per_speech_s": round(1000 * best[0] / speech_s, 1),
                             "cpu_ms_per_speech_s": round(1000 * best[1] / speech_s, 1),
                             "speech_s_per_wall_s": round(speech_s / best[0], 1),
                             "wer": round(word_error_rate([u.reference for u in utterances], best[2]), 4)})
                console.print(rows[-1])
    doc = record("moonshine", settings_that_matter(options.settings), {
        "threads": options.threads, "segments": len(segments), "speech_s": round(speech_s, 1), "rows": rows})
    return doc, write_result("moonshine", doc, options.out)

