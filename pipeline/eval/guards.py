"""Accuracy guards: the full measurements that hold the recogniser and the QA to figures measured before,
each a figure with its limit and a verdict (met / not met).

They run in `callqa bench check` (minutes each: every Asterisk prompt, every library leg), not in the
test suite; the tests run the same functions on a few utterances or calls with limits measured on those
(tests/eval/), so they fail on the same defects in seconds. A guard is a regression fence at about the
measured figure plus a little margin, not the goal the README's accuracy tables report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.eval.dataset import EvalUtterance

Bound = Literal["<=", ">="]


@dataclass(frozen=True)
class Limit:
    """One figure's bound: ``figure <= value`` or ``figure >= value``."""

    figure: str
    bound: Bound
    value: float

    def holds(self, got: float | None) -> bool:
        if got is None:
            return False
        return got <= self.value if self.bound == "<=" else got >= self.value

    def __str__(self) -> str:
        return f"{self.figure} {self.bound} {self.value:g}"


@dataclass
class GuardResult:
    """What a guard measured, against its limits; ``details`` are lines a reader needs to act on a miss."""

    name: str
    figures: dict[str, float | int | None]
    limits: tuple[Limit, ...]
    details: list[str] = field(default_factory=list)
    error: str = ""  # the guard could not measure (a missing set, a worker that died): not met

    def misses(self) -> list[str]:
        if self.error:
            return [f"did not run: {self.error}"]
        return [f"{limit}: got {self.figures.get(limit.figure)}" for limit in self.limits
                if not limit.holds(self.figures.get(limit.figure))]

    @property
    def met(self) -> bool:
        return not self.misses()

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "met": self.met, "figures": self.figures,
                "limits": [str(limit) for limit in self.limits], "misses": self.misses(), "details": self.details}


# Measured at commit d841012 (ours, 8k-mulaw; README, Accuracy): WER 8.55 % over 3286 Asterisk words, 87 of 95
# digit sequences exact; 5.30 % over the library's 4719 leg words. About 30 words and 3 sequences of margin.
ASTERISK = (Limit("wer", "<=", 0.095), Limit("digits_exact_rate", ">=", 0.88), Limit("reference_words", ">=", 3000))
LIBRARY_LEGS = (Limit("wer", "<=", 0.059), Limit("reference_words", ">=", 4500))
# Only a collapse: the loop guard cutting repeated digits once lost most of a 16-digit card ("4-1").
LIBRARY_NUMBERS = (Limit("digit_error_rate", "<=", 0.35), Limit("sequences", ">=", 20))


def wer_guard(name: str, utterances: Sequence[EvalUtterance], limits: tuple[Limit, ...], engine: Any = None) -> GuardResult:
    """WER and digit-sequence accuracy of ours (8 kHz μ-law, as the worker hears a call) on ``utterances``."""
    from pipeline.asr.engine import Engine
    from pipeline.eval.accuracy import score
    from pipeline.eval.conditions import conditioned
    from pipeline.eval.systems import Ours

    heard = conditioned(list(utterances), "8k-mulaw")
    row = score(name, "8k-mulaw", "ours", heard, Ours(engine or Engine.load()).transcribe(heard), wall_s=1.0)
    figures: dict[str, float | int | None] = {
        "utterances": row.utterances, "reference_words": row.reference_words, "word_errors": row.word_errors,
        "wer": round(row.wer, 4), "digit_sequences": row.digit_sequences,
        "digits_exact_rate": None if row.digits_exact_rate is None else round(row.digits_exact_rate, 4)}
    return GuardResult(name, figures, limits)


def numbers_guard(utterances: Sequence[EvalUtterance], limits: tuple[Limit, ...] = LIBRARY_NUMBERS,
                  engine: Any = None) -> GuardResult:
    """Digit sequences of the library's spoken numbers (already through μ-law: ``number_utterances``),
    each cut turn through the engine's VAD and recogniser as a streamed leg is."""
    from pipeline.asr.engine import Engine
    from pipeline.eval.numbers import digit_accuracy, spoken_digits

    engine = engine or Engine.load()
    pairs, details = [], []
    for u in utterances:
        text = " ".join(r.text for r in engine.transcribe_segments(engine.leg_segments(u.audio, 16000)))
        expected = spoken_digits(u.reference)
        pairs.append((expected, text))
        if spoken_digits(text) != expected:
            details.append(f"{u.id}: {expected} -> {spoken_digits(text)} ({text!r})")
    s = digit_accuracy(pairs)
    return GuardResult("library-numbers", {"sequences": s.sequences, "exact": s.exact,
                                           "digit_error_rate": round(s.digit_error_rate, 4)}, limits, details)


def asterisk_guard(every: int = 1, limits: tuple[Limit, ...] = ASTERISK, engine: Any = None) -> GuardResult:
    """The Asterisk prompts (every ``every``-th of them, in the set's order)."""
    from pipeline.eval.dataset import load_asterisk_set

    return wer_guard("asterisk", load_asterisk_set()[::every], limits, engine)


def library_legs_guard(legs: Sequence[str] = (), limits: tuple[Limit, ...] = LIBRARY_LEGS, engine: Any = None) -> GuardResult:
    """Whole library legs (``legs``: ids such as ``library/05_rude_agent/agent``; empty: all 46)."""
    from pipeline.eval.call_library import leg_utterances

    chosen = [u for u in leg_utterances() if not legs or u.id in legs]
    if legs and len(chosen) != len(legs):
        raise ValueError(f"unknown legs: {sorted(set(legs) - {u.id for u in chosen})}")
    return wer_guard("library-legs", chosen, limits, engine)


# The library offline (`callqa analyze` of each WAV against its manifest): verdicts agree at least this
# often; transcribed text may score sentiment a little differently from the scripts (measured 73.4 %
# against 74.5 %, and 13 trends right on both).
LIBRARY_OFFLINE = (Limit("metrics_outside_tolerance", "<=", 0), Limit("verdict_agreement", ">=", 0.95),
                   Limit("sentiment_shortfall", "<=", 0.03), Limit("trends_shortfall", "<=", 1))
# A WAV carries no hold events (the replay sends them): hold_ms is checked through the worker, not here.
NOT_OFFLINE = {"hold_ms"}
FOUND = {"met", "violated", "detected"}


def library_offline_guard(call_ids: Sequence[str] = (), limits: tuple[Limit, ...] = LIBRARY_OFFLINE,
                          engine: Any = None) -> GuardResult:
    """Every library call (or ``call_ids``) through `callqa analyze`: each manifest metric within its
    tolerance, rule and scorecard verdicts, and sentiment on what was transcribed against the scripts'."""
    from pipeline.analyze import analyze_recordings
    from pipeline.asr.engine import Engine
    from pipeline.eval.call_library import LIBRARY_DIR, compare, item_verdicts, load_manifest, metric_misses
    from pipeline.eval.sentiment import evaluate_scripts, evaluate_transcripts
    from pipeline.qa.call import QaConfig
    from pipeline.qa.rules import load_rules
    from pipeline.qa.scorecard import load_scorecard
    from pipeline.qa.sentiment import score_text

    rules_dir = Path(__file__).resolve().parents[2] / "rules"
    rule_set = load_rules(rules_dir)
    config = QaConfig(rule_set, load_scorecard(rules_dir / "scorecards" / "default.yaml", rule_set))
    question_ids = {q.question: q.id for q in config.scorecard.questions}
    manifest = load_manifest()
    calls = [c for c in manifest["calls"] if not call_ids or c["id"] in call_ids]
    analyses = analyze_recordings([LIBRARY_DIR / c["file"] for c in calls], engine or Engine.load(), config)
    details: list[str] = []
    compared, differing = 0, 0
    for call, a in zip(calls, analyses, strict=True):
        expected = call["expected"]
        metrics = {k: v for k, v in expected["metrics"].items() if k not in NOT_OFFLINE}
        details += [f"metric {m.call} {m.what}: expected {m.expected}, got {m.got}"
                    for m in metric_misses(call["id"], metrics, expected["tolerances"], a.qa.metrics)]
        rules = {name: "present" if v["verdict"] in FOUND else "absent" for name, v in a.rule_verdicts().items()}
        items = item_verdicts(((i.question, i.passed) for i in a.qa.items if i.passed is not None), question_ids)
        for n, found in (compare(call["id"], expected["rules"], rules, skip=expected.get("uncertain_rules", [])),
                         compare(call["id"], expected["items"], items, skip=expected["uncertain_items"])):
            compared, differing = compared + n, differing + len(found)
            details += [f"verdict {d.call} {d.what}: expected {d.expected}, got {d.got}" for d in found]
    manifest = {**manifest, "calls": calls}
    heard = evaluate_transcripts(
        [(a.call_id, [(s.start_ms, s.end_ms, s.text, score_text(s.text)) for s in a.leg_segments("customer")])
         for a in analyses], manifest)
    scripts = evaluate_scripts(call_ids=[c["id"] for c in calls])
    figures: dict[str, float | int | None] = {
        "calls": len(calls), "metrics_outside_tolerance": sum(d.startswith("metric") for d in details),
        "verdicts_compared": compared, "verdict_agreement": round(1 - differing / max(compared, 1), 4),
        "sentiment_agreement": round(heard.agreement, 4), "sentiment_agreement_scripts": round(scripts.agreement, 4),
        "sentiment_shortfall": round(scripts.agreement - heard.agreement, 4),
        "trends_right": heard.trends_right, "trends_shortfall": scripts.trends_right - heard.trends_right}
    return GuardResult("library-offline", figures, limits, details)


# Beam 5 in Whisper's 30 s window, float32 and batched, is faster-whisper's beam 5 on the same weights:
# the same text on every utterance (the eval set through μ-law), and not greedy's text on all of them.
BEAM_REFERENCE = (Limit("differ_from_reference", "<=", 0), Limit("differ_from_greedy", ">=", 1))


def beam_reference_guard(utterances: Sequence[EvalUtterance] = (), limits: tuple[Limit, ...] = BEAM_REFERENCE) -> GuardResult:
    """Ours (tiny.en, fp32, beam 5, full windows, every utterance in one batch) against faster-whisper beam 5
    in float32 (``utterances`` at 16 kHz; default: the eval set through 8 kHz μ-law)."""
    from faster_whisper import WhisperModel

    from pipeline.asr.ct2 import find_source
    from pipeline.asr.engine import Engine
    from pipeline.asr.results import AudioSegment, TranscriptResult
    from pipeline.config import get_settings
    from pipeline.eval.conditions import conditioned
    from pipeline.eval.dataset import load_eval_set

    heard = list(utterances) or conditioned(load_eval_set(), "8k-mulaw")
    base = get_settings().model_copy(update={"model": "tiny.en", "quantization": "fp32", "window_bucket_s": 0.0,
                                             "full_window_retry": False})
    segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in heard]

    def texts(beam_size: int) -> list[str]:
        results = Engine.load(settings=base.model_copy(update={"beam_size": beam_size})).recognizer.recognize(segments)
        return [r.text.strip() if isinstance(r, TranscriptResult) else f"<{r}>" for r in results]

    beam, greedy = texts(5), texts(1)
    folder = find_source("tiny.en").ctranslate2_folder(Path(base.models_dir) / ".ct2")
    reference = WhisperModel(str(folder), device="cpu", compute_type="float32", cpu_threads=2)
    details, differ = [], 0
    for u, ours in zip(heard, beam, strict=True):
        pieces, _ = reference.transcribe(u.audio, beam_size=5, temperature=0.0, without_timestamps=True,
                                         condition_on_previous_text=False)
        theirs = " ".join(s.text.strip() for s in pieces)
        if ours != theirs:
            differ += 1
            details.append(f"{u.id}: ours {ours!r}, faster-whisper {theirs!r}")
    figures: dict[str, float | int | None] = {"utterances": len(heard), "differ_from_reference": differ,
                                              "differ_from_greedy": sum(b != g for b, g in zip(beam, greedy, strict=True))}
    return GuardResult("beam-reference", figures, limits, details)
