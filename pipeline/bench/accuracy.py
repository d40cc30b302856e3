"""`callqa bench accuracy`: WER and digit-sequence accuracy per set and telephony condition, ours (at the
current settings and at each variant) and the other models (``--models``: the Moonshine family by
default) beside faster-whisper on the same weights and audio.

The sets, conditions and systems are pipeline/eval's (see pipeline/eval/README.md); this module runs them
with a progress bar, prints the tables and writes the result ``accuracy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.bench.variants import changed_settings, settings_variant
from pipeline.config import Settings, get_settings
from pipeline.eval.accuracy import AccuracyRow

SETS = ("eval", "asterisk", "library-numbers")
CONDITIONS = ("16k", "8k", "8k-mulaw", "8k-alaw")


@dataclass(frozen=True)
class AccuracyOptions:
    sets: tuple[str, ...] = SETS
    conditions: tuple[str, ...] = CONDITIONS
    reference: bool = True  # faster-whisper on the same weights and audio too
    threads: int = 2  # intra-op threads (ours), cpu_threads (faster-whisper)
    variants: tuple[str, ...] = ()  # ours again with these settings: "beam_size=5,context_tokens=64"
    reference_beams: tuple[int, ...] = (1,)  # a faster-whisper run per beam size
    # Other models at the same settings, a column each named by the model (built on first use): the
    # Moonshine family beside the Whisper model ``ours`` runs. One equal to the model setting is ``ours``.
    models: tuple[str, ...] = ("moonshine-tiny", "moonshine-base")
    ours: bool = True  # False: only the --models (and variants, reference) columns
    out: Path = RESULTS
    settings: Settings = field(default_factory=get_settings)


def run_accuracy(options: AccuracyOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    """Every system on every set under every condition; a bad variant raises BadVariant before any loading."""
    from pipeline.asr.engine import Engine
    from pipeline.asr.moonshine_graphs import is_moonshine
    from pipeline.eval.accuracy import comparison, evaluate, load_sets
    from pipeline.eval.systems import FasterWhisper, Ours

    settings = options.settings.model_copy(update={"intra_op_threads": options.threads})
    variants = [settings_variant(settings, spec) for spec in options.variants]  # bad specs fail before loading
    with console.status("loading the sets..."):
        chosen = load_sets(options.sets)
    systems: list[Any] = [Ours(Engine.load(settings=settings))] if options.ours else []
    models = [m for m in options.models if not (options.ours and m == settings.model)]
    systems += [Ours(Engine.load(settings=settings.model_copy(update={"model": m})), name=m) for m in models]
    systems += [Ours(Engine.load(settings=s), name=f"ours {label}") for label, s in variants]
    if options.reference:
        # faster-whisper runs Whisper's CTranslate2 weights: tiny.en's when the model setting is a Moonshine one.
        whisper = "tiny.en" if is_moonshine(settings.model) else settings.model
        systems += [FasterWhisper.on_our_weights(options.threads, beam, model=whisper,
                                                 cache=Path(settings.models_dir) / ".ct2")
                    for beam in options.reference_beams]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("accuracy", total=len(chosen) * len(options.conditions) * len(systems))
        started = [0]

        def step(what: str) -> None:  # called as each run starts: the runs before it are done
            progress.update(task, description=what, completed=started[0])
            started[0] += 1

        rows: list[AccuracyRow] = evaluate(systems, chosen, list(options.conditions), step)
    doc = record("accuracy", settings_that_matter(settings), {
        "variants": {f"ours {label}": changed_settings(settings, v) for label, v in variants},
        "reference_beams": list(options.reference_beams) if options.reference else [],
        "models": models,  # the other models' columns, named by model
        "sets": {name: {"utterances": len(u), "audio_s": round(sum(x.duration_s for x in u), 1)}
                 for name, u in chosen.items()},
        "rows": [r.as_json() for r in rows], "comparison": comparison(rows),
    })
    return doc, write_result("accuracy", doc, options.out)

