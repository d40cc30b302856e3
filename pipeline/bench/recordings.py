"""`callqa bench recordings`: the redacted recordings of the call library's calls that say PII, made as the worker
makes them (live model, redactor, checked cuts, Ogg/Opus), and measured: how close each cut lands to the words it
hides, whether the recording transcribed again still says any of the call's PII, what the cuts cost the rest of
the call (WER against the script, the original audio's beside the recording's), and the recording's size per
minute at each Opus compression level."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.config import Settings, get_settings

COMPRESSIONS = (0.99, 1.0, 0.95)  # the default first
PII_ONLY_SHARE = 0.6  # a span this much of its turn's text: the turn's own times are the span's


@dataclass(frozen=True)
class RecordingsOptions:
    out: Path = RESULTS
    settings: Settings = field(default_factory=get_settings)


def run_recordings(options: RecordingsOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    from pipeline.asr.engine import Engine
    from pipeline.eval.call_library import load_manifest

    settings = options.settings
    engine = Engine.load(settings=settings)
    calls = [c for c in load_manifest()["calls"] if c["pii"]]
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("recordings", total=len(calls))
        for call in calls:
            progress.update(task, description=call["id"])
            rows.append(measure_call(call, engine, settings))
            progress.advance(task)
    totals = summary(rows)
    doc = record("recordings", settings_that_matter(settings), {**totals, "calls": rows})
    return doc, write_result("recordings", doc, options.out)


def measure_call(call: dict[str, Any], engine: Any, settings: Settings) -> dict[str, Any]:
    from pipeline.audio import codecs
    from pipeline.contracts.messages import JobCut, JobRedaction
    from pipeline.eval.call_library import LIBRARY_DIR, find_leaks, redacted_reference
    from pipeline.eval.wer import word_errors
    from pipeline.ingest.replay import ReplayOptions, load_recording
    from pipeline.qa.call import CallAnalyzer, QaConfig
    from pipeline.qa.segment import Segment
    from pipeline.recordings.cuts import place_cuts, silenced
    from pipeline.recordings.encode import crosstalk_db, decode_call, encode_call

    rec = load_recording(LIBRARY_DIR / call["file"], ReplayOptions(encoding="mulaw"))
    rate = rec.sample_rate
    legs = {leg: codecs.decode(codecs.encode(x, "mulaw"), "mulaw") for leg, x in rec.legs.items()}
    analyzer = CallAnalyzer(call["id"], QaConfig.from_settings(settings))
    live = [analyzer.process(Segment(call["id"], leg, f"{leg}-{a}", a, b, text)).redacted.segment  # type: ignore[arg-type]
            for leg, a, b, text in transcript(engine, legs, rate)]
    turns = [JobRedaction(t.leg, t.start_ms, t.end_ms, t.digits_kept, [JobCut(*c) for c in t.cuts])
             for t in analyzer.redacted_turns]

    async def decode(segments: Sequence[Any]) -> list[Any]:
        return engine.recognizer.recognize(segments)

    cuts = asyncio.run(place_cuts(turns, {leg: (x, rate) for leg, x in legs.items()}, decode,
                                  settings.recordings_cut_margin_ms, settings.asr_lead_ms))
    kept = {leg: silenced(x, rate, [(c.start_ms, c.end_ms, c.kind) for c in cuts if c.leg == leg])
            for leg, x in legs.items()}
    minutes = max(len(x) for x in kept.values()) / rate / 60
    encoded = {level: encode_call(kept, rate, level) for level in COMPRESSIONS}
    sizes = {str(level): len(data) for level, data in encoded.items()}
    apart = {str(level): crosstalk_db(kept, *decode_call(data)) for level, data in encoded.items()}
    heard, heard_rate = decode_call(encode_call(kept, rate, settings.recordings_compression))
    # The recording's transcript as heard, not redacted: a leak must show.
    again = [Segment(call["id"], leg, f"{leg}-{a}", a, b, text)  # type: ignore[arg-type]
             for leg, a, b, text in transcript(engine, heard, heard_rate)]
    leaks = find_leaks(call["id"], call["pii"], [(s.segment_id, s.text) for s in again], in_text=True)
    wer = {name: sum((word_errors(redacted_reference(call, leg), " ".join(s.text for s in segs if s.leg == leg))
                      for leg in ("agent", "customer")), start=word_errors("", "")).wer
           for name, segs in (("original", live), ("recording", again))}
    return {"call": call["id"], "minutes": round(minutes, 2), "pii_spans": len(call["pii"]),
            "cuts": [{"leg": c.leg, "start_ms": c.start_ms, "end_ms": c.end_ms, "kind": c.kind, "how": c.how}
                     for c in cuts],
            "placement": placement(call, cuts), "leaks": [f"{x.kind}: {x.needle}" for x in leaks],
            "wer_original": round(wer["original"], 4), "wer_recording": round(wer["recording"], 4),
            "bytes": sizes, "kbytes_per_minute": {k: round(v / 1024 / minutes, 1) for k, v in sizes.items()},
            "crosstalk_db": apart}


def transcript(engine: Any, legs: dict[str, np.ndarray], rate: int) -> list[tuple[str, int, int, str]]:
    """(leg, start_ms, end_ms, text) of every speech segment the engine finds in each leg, in call order."""
    out = []
    for leg, samples in legs.items():
        segments = engine.leg_segments(samples, rate)
        out += [(leg, s.start_ms, s.end_ms, r.text)
                for s, r in zip(segments, engine.transcribe_segments(segments, keep_silence=True), strict=True)]
    return sorted(out, key=lambda t: (t[1], t[0] != "agent"))


def placement(call: dict[str, Any], cuts: Sequence[Any]) -> list[dict[str, Any]]:
    """Each PII span that is most of its turn (its times are the turn's): whether a cut covers it, and by how much
    the cut reaches beyond it on each side (ms)."""
    out = []
    for span in call["pii"]:
        turn = call["turns"][span["turn"]]
        if len(span["spoken"]) < PII_ONLY_SHARE * len(turn["text"]):
            continue
        over = [c for c in cuts if c.leg == span["leg"] and c.start_ms < span["end_ms"] and span["start_ms"] < c.end_ms]
        if not over:
            out.append({"kind": span["kind"], "covered": 0.0})
            continue
        first, last = min(c.start_ms for c in over), max(c.end_ms for c in over)
        covered = sum(min(c.end_ms, span["end_ms"]) - max(c.start_ms, span["start_ms"]) for c in over)
        out.append({"kind": span["kind"], "covered": round(covered / (span["end_ms"] - span["start_ms"]), 3),
                    "before_ms": span["start_ms"] - first, "after_ms": last - span["end_ms"]})
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    placed = [p for r in rows for p in r["placement"]]
    cuts = [c for r in rows for c in r["cuts"]]
    minutes = sum(r["minutes"] for r in rows)
    return {
        "calls": len(rows), "minutes": round(minutes, 1), "pii_spans": sum(r["pii_spans"] for r in rows),
        "leaks": sum(len(r["leaks"]) for r in rows),
        "cuts_by_step": {how: sum(c["how"] == how for c in cuts) for how in ("estimate", "widened", "segment")},
        "silenced_s": round(sum(c["end_ms"] - c["start_ms"] for c in cuts) / 1000, 1),
        "whole_turn_spans": len(placed),
        "whole_turn_spans_fully_covered": sum(p["covered"] >= 1.0 for p in placed),
        "median_before_ms": _median([p["before_ms"] for p in placed if "before_ms" in p]),
        "median_after_ms": _median([p["after_ms"] for p in placed if "after_ms" in p]),
        "wer_original": round(float(np.mean([r["wer_original"] for r in rows])), 4),
        "wer_recording": round(float(np.mean([r["wer_recording"] for r in rows])), 4),
        "kbytes_per_minute": {str(level): round(sum(r["bytes"][str(level)] for r in rows) / 1024 / minutes, 1)
                              for level in COMPRESSIONS},
        "worst_crosstalk_db": {str(level): max(r["crosstalk_db"][str(level)] for r in rows) for level in COMPRESSIONS},
    }


def _median(values: list[int]) -> float | None:
    return float(np.median(values)) if values else None

