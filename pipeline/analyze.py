"""`callqa analyze`: offline QA of recordings, the streaming worker's path without Kafka or ClickHouse.

A recording is brought to the telephony audio that `callqa replay` would send for it (8 kHz μ-law by
default; stereo: left agent, right customer, or the other way round; mono: one leg), each leg goes
through the engine's front end (16 kHz, Silero VAD segmentation; ``Engine.leg_segments``, the path of
`callqa transcribe`), every segment of the call through one ``SegmentBatcher`` (batched inference), and
the transcripts, in time order, through a ``CallAnalyzer`` (PII redaction, live rule alerts, metrics and
scorecard at the end). Segmentation, per-segment text and QA therefore equal what a worker stores for
the replayed recording (``tests/worker/test_analyze_matches_stream.py``).

``--json`` prints one object per file, one per line (``CallAnalysis.as_json``; ``format`` is bumped on
any incompatible change)::

    {"format": 1, "call_id": "<file stem>", "file": "<path>", "duration_ms": int,
     "encoding": "mulaw|alaw|pcm16", "sample_rate": int, "model": "<label, e.g. tiny.en@1/fp32>",
     "legs": {"agent"|"customer": {"channel": int, "segments": [
         {"segment_id": "<call>/<leg>/<start, 9 digits>", "start_ms": int, "end_ms": int,
          "text": "<redacted>", "redactions": int, "sentiment": float (-5..+5 of the redacted text)}]}},
     "score_pct": float, "auto_failed": bool, "scorecard": "<name>", "categories": [str] (rules/categories/),
     "items": [{"question": str, "weight": float, "passed": bool|null (null: not applicable),
                "rationale": str, "auto_fail": bool}],
     "rules": {"<rule name>": {"type": "must|must_not|detect",
                               "verdict": "met|missing|violated|clean|detected|not_detected",
                               "offsets_ms": [int]}},
     "metrics": {"<metric>": float},
     "live_alerts": [<event>],   # raised while the call runs, as the worker publishes them (QaAlert)
     "events": [<event>],        # the complete evaluation at call end
     "redactions": {"<marker>": int},
     "revision": 0|1,            # 1: the post-call pass (--final-model), scored on its own transcript
     "live": {"model": str, "score_pct": float, "auto_failed": bool,   # only with revision 1: the live
              "rules_changed": {"<rule>": {"live": verdict, "final": verdict}}, "segments_changed": int}}

with ``<event>`` = ``{"rule", "category", "leg", "kind" (match|missing|violation|alert), "offset_ms",
"text" (redacted), "severity", "segment_id"}``. Legs a file does not have are absent from ``legs``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.asr.batcher import SegmentBatcher
from pipeline.asr.engine import Engine
from pipeline.asr.results import TranscriptResult
from pipeline.audio import codecs
from pipeline.audio.files import AudioFileError
from pipeline.contracts.messages import LEGS, Encoding, Leg
from pipeline.ingest.replay import CallRecording, ReplayOptions, load_recording
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.rules import QaEvent, RuleSet
from pipeline.qa.scorecard import CallQaResult
from pipeline.qa.segment import Segment
from pipeline.segmentation import SpeechSegment
from pipeline.tables import keep_whole, print_table

JSON_FORMAT = 1
AgentChannel = Literal["left", "right"]
# What a rule's findings mean, by rule type: (found, not found).
_VERDICTS = {"must": ("met", "missing"), "must_not": ("violated", "clean"), "detect": ("detected", "not_detected")}


@dataclass(frozen=True)
class AnalyzeOptions:
    encoding: Encoding = "mulaw"  # the telephony encoding the audio goes through, as `callqa replay`'s
    agent_channel: AgentChannel = "left"  # stereo: which channel is the agent
    mono_leg: Leg = "agent"  # mono: which leg the one channel is
    frame_ms: int = 20  # the replay's frame: the call's duration is counted in whole frames, as the worker does


@dataclass(frozen=True)
class AnalyzedSegment:
    """A final segment as the worker stores it: redacted text, timing, id derived from call/leg/start."""

    segment_id: str
    leg: Leg
    start_ms: int
    end_ms: int
    text: str
    redactions: int
    sentiment: float = 0.0  # of the redacted text, -5..+5, as the worker stores it (pipeline/qa/sentiment.py)
    confidence: float = 0.0  # the model's, as the worker stores it (not in --json: the report's shape is fixed)
    avg_logprob: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"segment_id": self.segment_id, "start_ms": self.start_ms, "end_ms": self.end_ms,
                "text": self.text, "redactions": self.redactions, "sentiment": self.sentiment}


@dataclass(frozen=True)
class CallAnalysis:
    """The offline QA report of one recording."""

    call_id: str
    file: str
    duration_ms: int
    encoding: str
    sample_rate: int
    model: str
    channels: dict[Leg, int]  # leg -> channel of the file it came from
    segments: list[AnalyzedSegment]  # in time order, both legs
    live_alerts: list[QaEvent]
    qa: CallQaResult
    rule_set: RuleSet = field(repr=False)
    redactions: dict[str, int] = field(default_factory=dict)
    revision: int = 0  # 0: the live pass; 1: the post-call pass (``final_model``), scored on its transcript
    live: CallAnalysis | None = field(default=None, repr=False)  # with revision 1: the live pass it replaces

    def leg_segments(self, leg: Leg) -> list[AnalyzedSegment]:
        return [s for s in self.segments if s.leg == leg]

    def rule_verdicts(self) -> dict[str, dict[str, Any]]:
        """Per rule of the rule set: its verdict on this call and where it was found."""
        out: dict[str, dict[str, Any]] = {}
        for rule in self.rule_set.rules:
            found = [e.offset_ms for e in self.qa.events if e.rule == rule.name and e.kind != "missing"]
            yes, no = _VERDICTS[rule.type]
            out[rule.name] = {"type": rule.type, "verdict": yes if found else no, "offsets_ms": found}
        return out

    def as_json(self) -> dict[str, Any]:
        """The documented structure (module docstring)."""
        return {
            "format": JSON_FORMAT, "call_id": self.call_id, "file": self.file, "duration_ms": self.duration_ms,
            "encoding": self.encoding, "sample_rate": self.sample_rate, "model": self.model,
            "legs": {leg: {"channel": channel, "segments": [s.as_json() for s in self.leg_segments(leg)]}
                     for leg, channel in self.channels.items()},
            "score_pct": self.qa.score_pct, "auto_failed": self.qa.auto_failed, "scorecard": self.qa.scorecard,
            "categories": list(self.qa.categories),
            "items": [{"question": i.question, "weight": i.weight, "passed": i.passed, "rationale": i.rationale,
                       "auto_fail": i.auto_fail} for i in self.qa.items],
            "rules": self.rule_verdicts(),
            "metrics": dict(self.qa.metrics),
            "live_alerts": [_event_json(e) for e in self.live_alerts],
            "events": [_event_json(e) for e in self.qa.events],
            "redactions": dict(self.redactions),
            "revision": self.revision,
            **({"live": self.live_summary()} if self.live is not None else {}),
        }

    def live_summary(self) -> dict[str, Any]:
        """With a post-call pass: the live pass's model, score and verdicts, and what the final pass changed."""
        assert self.live is not None
        live_rules, final_rules = self.live.rule_verdicts(), self.rule_verdicts()
        changed = {name: {"live": live_rules[name]["verdict"], "final": verdict["verdict"]}
                   for name, verdict in final_rules.items()
                   if name in live_rules and live_rules[name]["verdict"] != verdict["verdict"]}
        # By segment id, not position: a pass may find no words in a segment the other one transcribed.
        live_texts = {s.segment_id: s.text for s in self.live.segments}
        final_texts = {s.segment_id: s.text for s in self.segments}
        reworded = sum(live_texts.get(k) != final_texts.get(k) for k in live_texts.keys() | final_texts.keys())
        return {"model": self.live.model, "score_pct": self.live.qa.score_pct,
                "auto_failed": self.live.qa.auto_failed, "rules_changed": changed, "segments_changed": reworded}


def _event_json(e: QaEvent) -> dict[str, Any]:
    return {"rule": e.rule, "category": e.category, "leg": e.leg, "kind": e.kind, "offset_ms": e.offset_ms,
            "text": e.text, "severity": e.severity, "segment_id": e.segment_id}


def telephony_audio(path: str | Path, options: AnalyzeOptions) -> tuple[CallRecording, dict[Leg, int]]:
    """The call's legs as `callqa replay` sends them (rate, encoding), and the file channel of each leg."""
    rec = load_recording(path, ReplayOptions(encoding=options.encoding, mono_leg=options.mono_leg,
                                             frame_ms=options.frame_ms))
    if len(rec.legs) == 1:
        return rec, {options.mono_leg: 0}
    if options.agent_channel == "right":
        rec = CallRecording(rec.source, {"agent": rec.legs["customer"], "customer": rec.legs["agent"]},
                            rec.sample_rate, {"agent": rec.encoded["customer"], "customer": rec.encoded["agent"]})
        return rec, {"agent": 1, "customer": 0}
    return rec, {"agent": 0, "customer": 1}


def segment_legs(engine: Engine, rec: CallRecording, encoding: str) -> list[tuple[Leg, SpeechSegment]]:
    """Every leg's speech segments, from exactly the bytes a worker would receive (then decoded)."""
    return [
        (leg, segment)
        for leg in LEGS if leg in rec.encoded
        for segment in engine.leg_segments(codecs.decode(rec.encoded[leg], encoding), rec.sample_rate)
    ]


@dataclass(frozen=True)
class FinalPass:
    """The post-call pass: the accurate model's engine (its label) and a batcher of it."""

    engine: Engine
    batcher: SegmentBatcher


async def analyze_file(
    path: str | Path, engine: Engine, batcher: SegmentBatcher, config: QaConfig,
    options: AnalyzeOptions | None = None,
    on_segmented: Callable[[int], None] | None = None, on_transcribed: Callable[[], None] | None = None,
    final: FinalPass | None = None,
) -> CallAnalysis:
    """Analyse one recording (raises AudioFileError naming the file when it cannot be read). With ``final``,
    the live pass's segments are decoded again by the accurate model and the analysis returned is that
    post-call pass (revision 1), scored on its transcript, with the live one in ``live``."""
    options = options or AnalyzeOptions()
    rec, channels = await asyncio.to_thread(telephony_audio, path, options)
    pairs = await asyncio.to_thread(segment_legs, engine, rec, options.encoding)
    if on_segmented is not None:
        on_segmented(len(pairs) * (2 if final else 1))
    call_id = Path(path).stem
    frame_samples = rec.sample_rate * options.frame_ms // 1000
    duration_ms = max((rec.frame_count(leg, frame_samples) for leg in rec.legs), default=0) * options.frame_ms

    async def one_pass(model: str, of: SegmentBatcher, revision: int) -> CallAnalysis:
        scored = await score_pass(call_id, pairs, of, config, duration_ms, on_transcribed=on_transcribed)
        return CallAnalysis(
            call_id=call_id, file=str(path), duration_ms=duration_ms, encoding=options.encoding,
            sample_rate=rec.sample_rate, model=model, channels=channels, segments=scored.segments,
            live_alerts=scored.live_alerts, qa=scored.qa, rule_set=config.rule_set,
            redactions=scored.redactions, revision=revision,
        )

    live = await one_pass(engine.model_label, batcher, 0)
    if final is None:
        return live
    # The same segments, as the worker's post-call pass will take them: only the words may change.
    post = await one_pass(final.engine.model_label, final.batcher, 1)
    return replace(post, live=live)


@dataclass(frozen=True)
class PassScore:
    """One pass over a call's segments: what it stores (redacted), its live alerts, its QA."""

    segments: list[AnalyzedSegment]
    live_alerts: list[QaEvent]
    qa: CallQaResult
    redactions: dict[str, int]


async def score_pass(call_id: str, pairs: Sequence[tuple[Leg, SpeechSegment]], batcher: SegmentBatcher,
                     config: QaConfig, duration_ms: int, on_transcribed: Callable[[], None] | None = None) -> PassScore:
    """Transcribe a call's segments with ``batcher`` and score them (``score_transcripts``)."""
    results = await asyncio.gather(*(_transcribe(batcher, s, on_transcribed) for _, s in pairs))
    return score_transcripts(call_id, pairs, results, config, duration_ms)


def score_transcripts(call_id: str, pairs: Sequence[tuple[Leg, SpeechSegment]],
                      results: Sequence[TranscriptResult | None], config: QaConfig, duration_ms: int,
                      holds_ms: Sequence[tuple[int, int]] = (),
                      pauses_ms: Sequence[tuple[int, int]] = ()) -> PassScore:
    """A call's transcripts (None: silence or no text) through the call analyzer in time order, as the
    worker releases them: redaction, rules, and the scorecard at the end."""
    transcripts = [(leg, s, r) for (leg, s), r in zip(pairs, results, strict=True) if r is not None]
    analyzer = CallAnalyzer(call_id, config)
    segments, live_alerts = _redact_and_match(analyzer, transcripts)
    return PassScore(segments, live_alerts, analyzer.finalize(duration_ms, holds_ms, pauses_ms),
                     dict(analyzer.redaction_counts))


async def _transcribe(batcher: SegmentBatcher, segment: SpeechSegment,
                      on_transcribed: Callable[[], None] | None) -> TranscriptResult | None:
    result = await batcher.submit(segment)
    if on_transcribed is not None:
        on_transcribed()
    return transcript_or_none(result)


def transcript_or_none(result: TranscriptResult) -> TranscriptResult | None:
    """The worker's rule: a segment judged silence, or with no text, is not a transcript."""
    return None if result.is_silence or not result.text.strip() else result


def _redact_and_match(
    analyzer: CallAnalyzer, transcripts: Sequence[tuple[Leg, SpeechSegment, TranscriptResult]]
) -> tuple[list[AnalyzedSegment], list[QaEvent]]:
    """Feed the call's transcripts to its analyzer in time order: the stored segments and the live alerts."""
    call_id = analyzer.call_id
    segments: list[AnalyzedSegment] = []
    live: list[QaEvent] = []
    for leg, s, r in sorted(transcripts, key=lambda t: (t[1].start_ms, LEGS.index(t[0]))):
        analyzed = analyzer.process(Segment(call_id, leg, f"{call_id}/{leg}/{s.start_ms:09d}",
                                            s.start_ms, s.end_ms, r.text.strip()))
        out = analyzed.redacted.segment
        segments.append(AnalyzedSegment(out.segment_id, leg, out.start_ms, out.end_ms, out.text,
                                        analyzed.redacted.total, analyzed.sentiment, r.confidence,
                                        r.avg_logprob))
        live.extend(analyzed.events)
    return segments, live


async def analyze_paths(
    paths: Sequence[Path], engine: Engine, config: QaConfig, options: AnalyzeOptions,
    emit: Callable[[CallAnalysis], None], err_console: Console, final_engine: Engine | None = None,
) -> int:
    """Analyse files one after another through one batcher (and one of ``final_engine``: the post-call
    pass), ``emit`` each report as it is ready, print one line per file that fails (naming file and cause)
    and go on; returns how many failed."""
    batcher = engine.new_batcher()
    await batcher.start()
    final = await _start_final(final_engine)
    failures = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err_console, transient=True) as progress:
            for path in paths:
                task = progress.add_task(f"{escape(path.name)}: segmenting", total=None)
                segmented, transcribed = _progress_callbacks(progress, task, escape(path.name))
                try:
                    emit(await analyze_file(path, engine, batcher, config, options, segmented, transcribed, final))
                except Exception as exc:  # noqa: BLE001 - one line per failed file, then the next file
                    failures += 1
                    err_console.print(f"[red]error:[/red] {escape(describe_failure(path, exc))}")
                finally:
                    progress.remove_task(task)
    finally:
        await batcher.close()
        if final is not None:
            await final.batcher.close()
    return failures


async def _start_final(final_engine: Engine | None) -> FinalPass | None:
    if final_engine is None:
        return None
    final = FinalPass(final_engine, final_engine.new_batcher())
    await final.batcher.start()
    return final


def analyze_recordings(
    paths: Sequence[str | Path], engine: Engine, config: QaConfig, options: AnalyzeOptions | None = None,
    final_engine: Engine | None = None,
) -> list[CallAnalysis]:
    """For tests and scripts (no event loop running): every file's analysis (with ``final_engine``, the
    post-call pass's, the live one in ``live``); raises the first failure."""

    async def run() -> list[CallAnalysis]:
        batcher = engine.new_batcher()
        await batcher.start()
        final = await _start_final(final_engine)
        try:
            return [await analyze_file(path, engine, batcher, config, options, final=final) for path in paths]
        finally:
            await batcher.close()
            if final is not None:
                await final.batcher.close()

    return asyncio.run(run())


def _progress_callbacks(
    progress: Progress, task: TaskID, name: str
) -> tuple[Callable[[int], None], Callable[[], None]]:
    def segmented(total: int) -> None:
        progress.update(task, description=f"{name}: transcribing", total=total)

    def transcribed() -> None:
        progress.advance(task)

    return segmented, transcribed


def describe_failure(path: Path, exc: Exception) -> str:
    """One line naming the file and the cause (an AudioFileError names the file itself)."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return message if isinstance(exc, AudioFileError) else f"{path}: {message}"


# ---- rendering ------------------------------------------------------------------------------------
def render_analysis(a: CallAnalysis, console: Console) -> None:
    """The report of one call: score, scorecard items, rule verdicts, metrics, live alerts, transcript."""
    legs = ", ".join(f"{leg} = channel {ch}" for leg, ch in a.channels.items())
    if len(a.channels) == 1:
        legs = f"mono: one leg, analysed as the {next(iter(a.channels))}"
    score = f"{a.qa.score_pct:.1f} %" + (" [red]AUTO-FAIL[/red]" if a.qa.auto_failed else "")
    console.print(f"[bold]{escape(a.call_id)}[/bold]  {escape(a.file)}  {a.duration_ms / 1000:.1f} s  "
                  f"({escape(legs)}; {a.encoding} {a.sample_rate} Hz; {escape(a.model)})")
    console.print(f"score: [bold]{score}[/bold]  (scorecard {escape(a.qa.scorecard)}); categories: "
                  f"{escape(', '.join(a.qa.categories) or 'none')}")
    if a.live is not None:
        live = a.live_summary()
        changed = ", ".join(f"{rule} {v['live']} → {v['final']}" for rule, v in live["rules_changed"].items())
        console.print(f"post-call pass ({escape(a.model)}) over the live pass ({escape(live['model'])}, score "
                      f"{live['score_pct']:.1f} %): {live['segments_changed']} segments reworded; "
                      f"{escape(changed) or 'no verdict changed'}")
    print_table(console, _items_table(a))
    print_table(console, _rules_table(a))
    metrics = keep_whole(Table("metric", "value", title="conversation metrics"), "metric", "value")
    for name, value in sorted(a.qa.metrics.items()):
        metrics.add_row(escape(name), f"{value:,.2f}")
    print_table(console, metrics)
    print_table(console, _alerts_table(a), optional=("leg", "kind"))
    transcript = keep_whole(Table("time", "leg", "text", title="transcript (redacted)"), "time", "leg")
    for s in a.segments:
        transcript.add_row(f"{s.start_ms / 1000:6.1f}-{s.end_ms / 1000:6.1f}", s.leg, escape(s.text))
    print_table(console, transcript)


def _items_table(a: CallAnalysis) -> Table:
    items = keep_whole(Table("question", "weight", "passed", "rationale", title="scorecard items"),
                       "weight", "passed")
    for i in a.qa.items:
        passed = "n/a" if i.passed is None else "yes" if i.passed else "[red]no[/red]"
        items.add_row(escape(i.question) + (" (auto-fail)" if i.auto_fail else ""), f"{i.weight:g}", passed,
                      escape(i.rationale))
    return items


def _rules_table(a: CallAnalysis) -> Table:
    rules = keep_whole(Table("rule", "type", "verdict", "at s", title="rules"), "rule", "type", "verdict")
    for name, v in a.rule_verdicts().items():
        bad = v["verdict"] in ("missing", "violated")
        verdict = f"[red]{v['verdict']}[/red]" if bad else v["verdict"]
        rules.add_row(escape(name), v["type"], verdict, ", ".join(f"{ms / 1000:.1f}" for ms in v["offsets_ms"]))
    return rules


def _alerts_table(a: CallAnalysis) -> Table:
    alerts = keep_whole(Table("at s", "rule", "kind", "leg", "severity", "text", title="live alerts"),
                        "at s", "rule", "kind", "leg", "severity")
    for e in a.live_alerts:
        alerts.add_row(f"{e.offset_ms / 1000:.1f}", escape(e.rule), e.kind, e.leg, e.severity, escape(e.text))
    if not a.live_alerts:
        alerts.add_row("-", "none", "", "", "", "")
    return alerts

