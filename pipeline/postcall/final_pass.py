"""The post-call pass over one call, without Kafka: its audio in, its next revision's rows out.

Each leg of the call's audio goes through the live model's front end (the same VAD, so the same segments
and segment ids as the live pass), every segment is decoded by the accurate model, and the transcripts go
through a new call analyzer in time order (redaction, rules, scorecard, metrics with the call's holds),
exactly as `callqa analyze --final-model` scores its revision 1. Live-first scheduling and the CPU the
pass takes are the caller's (``Decode``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.analyze import CallAnalysis, score_transcripts, transcript_or_none
from pipeline.asr.engine import Engine
from pipeline.asr.results import TranscriptResult
from pipeline.contracts.messages import LEGS, Leg, PostCallJob
from pipeline.postcall.audio import CallAudio
from pipeline.postcall.rows import RevisionRows, job_calls_row, model_of, revision_rows
from pipeline.qa.call import QaConfig
from pipeline.segmentation import SpeechSegment

T = TypeVar("T")

# Decodes a chunk of a call's segments with the accurate model: one result (or exception) per segment.
Decode = Callable[[Sequence[SpeechSegment]], Awaitable[list[TranscriptResult | Exception]]]


class PostCallError(RuntimeError):
    """A call's pass could not be completed (a segment the accurate model failed on); names call and why."""


@dataclass(frozen=True)
class PassOutcome:
    analysis: CallAnalysis
    rows: RevisionRows
    segmenting_cpu_s: float = 0.0  # the front end's (VAD) CPU time over the call's legs


def leg_segments(front_end: Engine, audio: CallAudio) -> list[tuple[Leg, SpeechSegment]]:
    """Every leg's speech segments, as the live pass found them (the front end does not depend on how
    the audio was chunked)."""
    return [(leg, segment) for leg in LEGS if leg in audio.legs
            for segment in front_end.leg_segments(audio.legs[leg].samples, audio.legs[leg].sample_rate)]


async def transcribe_call(job: PostCallJob, audio: CallAudio, front_end: Engine, model_label: str, decode: Decode,
                          config: QaConfig, chunk: int = 8) -> PassOutcome:
    """The call's next revision: its segments decoded by ``decode`` in chunks of similar length, scored."""
    pairs, segmenting_cpu_s = await asyncio.to_thread(timed, leg_segments, front_end, audio)
    # Longest first and similar lengths together: a batch pads little, and the call's last chunk is short.
    order = sorted(range(len(pairs)), key=lambda i: -(pairs[i][1].end_ms - pairs[i][1].start_ms))
    results: list[TranscriptResult | None] = [None] * len(pairs)
    for at in range(0, len(order), max(1, chunk)):
        picked = order[at: at + chunk]
        decoded = await decode([pairs[i][1] for i in picked])
        for i, outcome in zip(picked, decoded, strict=True):
            if isinstance(outcome, Exception):
                leg, seg = pairs[i]
                raise PostCallError(f"call {job.call_id}: {leg} segment at {seg.start_ms} ms: {outcome}") from outcome
            results[i] = transcript_or_none(outcome)
    scored = score_transcripts(job.call_id, pairs, results, config, job.audio_ms, job.hold_intervals(),
                               job.pause_intervals())
    rates = {leg.sample_rate for leg in audio.legs.values()}
    analysis = CallAnalysis(
        call_id=job.call_id, file=f"{job.audio_topic}[{job.audio_partition}]", duration_ms=job.audio_ms,
        encoding="topic", sample_rate=min(rates, default=0), model=model_label,
        channels={leg: i for i, leg in enumerate(audio.legs)}, segments=scored.segments,
        live_alerts=scored.live_alerts, qa=scored.qa, rule_set=config.rule_set, redactions=scored.redactions,
        revision=job.revision,
    )
    rows = revision_rows(job_calls_row(job), analysis, job.revision, model_of(model_label), job.requested_at_ms)
    return PassOutcome(analysis, rows, segmenting_cpu_s)


def timed(work: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``work(*args)`` and the CPU time its thread spent on it."""
    started = time.thread_time()
    result = work(*args)
    return result, time.thread_time() - started
